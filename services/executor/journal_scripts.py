"""The journal's compare-and-set scripts (Lua, run atomically by Redis).

Each takes the workflow hash as KEYS[1] and checks it before it changes anything;
`services/executor/journal.py` calls them.
"""

# Every script starts with this: reads a field of the workflow with a default, so a
# workflow journaled by an older executor (without the newer fields) is still read.
_FIELD = """
local function field(name, default)
  local value = redis.call('HGET', KEYS[1], name)
  if value then return value end
  return default
end
local function bump() redis.call('HINCRBY', KEYS[1], 'version', 1) end
-- A workflow ended here owes its final announcement (event, locks, parent) until the executor
-- says it made it: the notice is kept with the final state, the task indexed by when.
local function owe_final(index, notice, at_ms, task_id)
  redis.call('HSET', KEYS[1], 'finalise', notice)
  redis.call('ZADD', index, at_ms, task_id)
end
"""

# Creates the workflow (applying a control that arrived before it), or takes it over under a
# newer epoch. A task terminated before it arrived owes its announcement (KEYS[4], ARGV[6]
# now in ms). ARGV[7]: the trace context the workflow runs in (packed, common/tracing.py),
# for the sweeps that move it on without a message; a takeover keeps the first one.
# Returns {'new'|'paused'|'terminated'|'takeover'|'stale', actor, reason, id}.
START = _FIELD + """
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if epoch and tonumber(epoch) >= tonumber(ARGV[1]) then return {'stale'} end
if epoch then
  redis.call('HSET', KEYS[1], 'epoch', ARGV[1])
  bump()
  return {'takeover'}
end
local pending = redis.call('HGET', KEYS[2], 'action')
local actor = redis.call('HGET', KEYS[2], 'actor') or ''
local reason = redis.call('HGET', KEYS[2], 'reason') or ''
local control = redis.call('HGET', KEYS[2], 'control_id') or ''
local state = 'running'
if pending == 'pause' then state = 'paused' elseif pending == 'terminate' then
  state = 'terminated' end
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'task', ARGV[2], 'state', state, 'step', 0,
  'attempt', 0, 'run', 0, 'step_state', 'scheduled', 'command_id', '', 'deadline_ms', 0,
  'outputs', '{}', 'version', 1, 'pause', '', 'queries', 0, 'resent', 0, 'query_id', '',
  'waiting', 0, 'waiting_outputs', '{}', 'children_cmd', '', 'reason', '', 'cause', '',
  'trace', ARGV[7] or '')
redis.call('DEL', KEYS[2])
if state == 'running' then redis.call('ZADD', KEYS[3], ARGV[3], ARGV[4]) end
if state == 'terminated' then
  redis.call('HSET', KEYS[1], 'cause', 'terminated', 'reason', reason)
  redis.call('EXPIRE', KEYS[1], ARGV[5])
  owe_final(KEYS[4], cjson.encode({state = 'terminated', previous = 'dispatched',
    reason = 'terminate: ' .. reason, cause = 'terminated', actor = actor}), ARGV[6], ARGV[4])
end
if state == 'running' then return {'new', actor, reason, control} end
return {state, actor, reason, control}
"""

# Marks step ARGV[1] attempt ARGV[2] of run ARGV[6] started with command ARGV[3], if the
# workflow is exactly there and nobody started it yet.
STEP_STARTED = _FIELD + """
if field('state', '') ~= 'running' then return 0 end
if tonumber(field('step', '-1')) ~= tonumber(ARGV[1]) then return 0 end
if tonumber(field('attempt', '0')) ~= tonumber(ARGV[2]) then return 0 end
if tonumber(field('run', '0')) ~= tonumber(ARGV[6]) then return 0 end
if field('step_state', '') ~= 'scheduled' then return 0 end
redis.call('HSET', KEYS[1], 'step_state', 'started', 'command_id', ARGV[3],
  'deadline_ms', ARGV[4], 'queries', 0, 'resent', 0, 'query_id', '', 'waiting', 0,
  'waiting_outputs', '{}')
bump()
redis.call('SET', KEYS[2], ARGV[5], 'EX', ARGV[7])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[5])
redis.call('ZREM', KEYS[4], ARGV[5])
return 1
"""

# Ends the current step: ARGV[5] is 'completed', 'skipped' (a scheduled step whose guard
# does not hold) or 'failed' (with a retry due at ARGV[9] epoch ms, or '' for no retry).
# Then moves to the next step, pauses there if a pause was requested, or finishes the task.
# A final state owes its announcement (KEYS[4], ARGV[14] the notice, ARGV[15] now in ms).
# Returns {'next'|'retry'|'paused'|'succeeded'|'failed'|'stale', pause request}.
STEP_ENDED = _FIELD + """
local wf = KEYS[1]
if field('state', '') ~= 'running' then return {'stale'} end
if tonumber(field('step', '-1')) ~= tonumber(ARGV[2]) then return {'stale'} end
if tonumber(field('attempt', '0')) ~= tonumber(ARGV[3]) then return {'stale'} end
if tonumber(field('run', '0')) ~= tonumber(ARGV[4]) then return {'stale'} end
local outcome = ARGV[5]
if outcome == 'skipped' then
  if field('step_state', '') ~= 'scheduled' then return {'stale'} end
else
  if field('step_state', '') ~= 'started' then return {'stale'} end
  if field('command_id', '') ~= ARGV[1] then return {'stale'} end
end
bump()
redis.call('ZREM', KEYS[2], ARGV[7])
redis.call('ZREM', KEYS[3], ARGV[7])
if outcome ~= 'failed' then
  local outputs = cjson.decode(field('outputs', '{}'))
  outputs[ARGV[2]] = cjson.decode(ARGV[6])
  redis.call('HSET', wf, 'outputs', cjson.encode(outputs))
  local nxt = tonumber(ARGV[2]) + 1
  if nxt >= tonumber(ARGV[13]) then
    redis.call('HSET', wf, 'step_state', outcome, 'state', 'succeeded', 'reason', ARGV[10],
      'cause', '', 'pause', '')
    redis.call('EXPIRE', wf, ARGV[12])
    owe_final(KEYS[4], ARGV[14], ARGV[15], ARGV[7])
    return {'succeeded'}
  end
  redis.call('HSET', wf, 'step', nxt, 'attempt', 0, 'step_state', 'scheduled',
    'command_id', '', 'query_id', '', 'waiting', 0)
else
  if ARGV[9] == '' then
    redis.call('HSET', wf, 'step_state', 'failed', 'state', 'failed', 'reason', ARGV[10],
      'cause', ARGV[11], 'pause', '', 'query_id', '')
    redis.call('EXPIRE', wf, ARGV[12])
    owe_final(KEYS[4], ARGV[14], ARGV[15], ARGV[7])
    return {'failed'}
  end
  redis.call('HSET', wf, 'attempt', tonumber(ARGV[3]) + 1, 'step_state', 'scheduled',
    'command_id', '', 'query_id', '', 'waiting', 0)
end
local pause = field('pause', '')
if pause ~= '' then
  redis.call('HSET', wf, 'state', 'paused', 'pause', '')
  return {'paused', pause}
end
if outcome == 'failed' then
  redis.call('ZADD', KEYS[3], ARGV[9], ARGV[7])
  return {'retry'}
end
redis.call('ZADD', KEYS[2], ARGV[8], ARGV[7])
return {'next'}
"""

# Recovery of a started step past its deadline: counts one more status query (or centre
# re-run), records the query's id (ARGV[2], '' for a re-run) and a new deadline, and indexes
# the query's command id to the task with a marker (ARGV[6], '' for none).
RECOVERY = _FIELD + """
if field('state', '') ~= 'running' then return 0 end
if field('step_state', '') ~= 'started' then return 0 end
if field('command_id', '') ~= ARGV[1] then return 0 end
if field('query_id', '') ~= '' then return 0 end
if tonumber(field('queries', '0')) >= tonumber(ARGV[4]) then return 0 end
redis.call('HINCRBY', KEYS[1], 'queries', 1)
redis.call('HSET', KEYS[1], 'query_id', ARGV[2], 'deadline_ms', ARGV[3])
bump()
if ARGV[6] ~= '' then redis.call('SET', KEYS[2], ARGV[6], 'EX', ARGV[7]) end
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[5])
return 1
"""

# A status query (ARGV[2]) was answered "not in the journal" (ARGV[4] = '1': the command is
# sent again, once) or "in progress": the deadline moves and the query is no longer
# outstanding. With ARGV[2] '' (no query outstanding) it only moves the deadline; with
# ARGV[4] = 'keep' it moves the deadline and the query stays outstanding (a wait that started
# over because the broker was unreachable during it).
QUERY_ANSWERED = _FIELD + """
if field('state', '') ~= 'running' then return 0 end
if field('step_state', '') ~= 'started' then return 0 end
if field('command_id', '') ~= ARGV[1] then return 0 end
if field('query_id', '') ~= ARGV[2] then return 0 end
if ARGV[4] == '1' then
  if tonumber(field('resent', '0')) >= 1 then return 0 end
  redis.call('HSET', KEYS[1], 'resent', 1)
end
if ARGV[4] == 'keep' then
  redis.call('HSET', KEYS[1], 'deadline_ms', ARGV[3])
else
  redis.call('HSET', KEYS[1], 'query_id', '', 'deadline_ms', ARGV[3])
end
bump()
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[5])
return 1
"""

# The started centre step ARGV[1] split into child tasks ARGV[4..]: records them (a re-run
# of the same command adds the same ones; a new command starts a fresh set). Returns
# {children, finished, failed} or {} if the step is no longer current.
AWAIT_CHILDREN = _FIELD + """
if field('state', '') ~= 'running' then return {} end
if field('step_state', '') ~= 'started' then return {} end
if field('command_id', '') ~= ARGV[1] then return {} end
if field('children_cmd', '') ~= ARGV[1] then
  redis.call('DEL', KEYS[2], KEYS[3])
  redis.call('HSET', KEYS[1], 'children_cmd', ARGV[1])
end
for i = 4, #ARGV do redis.call('SADD', KEYS[2], ARGV[i]) end
redis.call('EXPIRE', KEYS[2], ARGV[3])
redis.call('HSET', KEYS[1], 'waiting', redis.call('SCARD', KEYS[2]),
  'waiting_outputs', ARGV[2])
bump()
local failed = 0
local outcomes = redis.call('HGETALL', KEYS[3])
for i = 2, #outcomes, 2 do if outcomes[i] ~= 'succeeded' then failed = failed + 1 end end
return {redis.call('SCARD', KEYS[2]), redis.call('HLEN', KEYS[3]), failed}
"""

# Child ARGV[1] of the parent (KEYS[1]) finished in state ARGV[2]: recorded if the parent
# still waits for it at step ARGV[3]. Returns {children, finished, failed} or {}.
CHILD_DONE = _FIELD + """
if field('state', '') ~= 'running' then return {} end
if field('step_state', '') ~= 'started' then return {} end
if tonumber(field('step', '-1')) ~= tonumber(ARGV[3]) then return {} end
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 0 then return {} end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[3], ARGV[4])
local failed = 0
local outcomes = redis.call('HGETALL', KEYS[3])
for i = 2, #outcomes, 2 do if outcomes[i] ~= 'succeeded' then failed = failed + 1 end end
return {redis.call('SCARD', KEYS[2]), redis.call('HLEN', KEYS[3]), failed}
"""

# An operator's transition, applied only if nothing changed since the workflow was read
# (version ARGV[1]) and this control (ARGV[3]) was not applied before. ARGV[4] holds the
# fields to set; ARGV[5] what becomes of its timers: 'keep', 'clear' (paused, final) or
# 'kick' (start the scheduled step by ARGV[6]); ARGV[7] 'persist' | 'expire' | 'keep'. A
# transition to a final state sets the field 'finalise' and so owes its announcement
# (KEYS[5], ARGV[9] now in ms).
# Returns 1 applied, 0 changed meanwhile, -1 a duplicate control.
TRANSITION = _FIELD + """
if tonumber(field('version', '0')) ~= tonumber(ARGV[1]) then return 0 end
if ARGV[3] ~= '' and redis.call('SISMEMBER', KEYS[4], ARGV[3]) == 1 then return -1 end
local fields = cjson.decode(ARGV[4])
for name, value in pairs(fields) do redis.call('HSET', KEYS[1], name, value) end
if fields['finalise'] then owe_final(KEYS[5], fields['finalise'], ARGV[9], ARGV[2]) end
bump()
if ARGV[5] == 'clear' then
  redis.call('ZREM', KEYS[2], ARGV[2])
  redis.call('ZREM', KEYS[3], ARGV[2])
elseif ARGV[5] == 'kick' then
  redis.call('ZREM', KEYS[3], ARGV[2])
  redis.call('ZADD', KEYS[2], ARGV[6], ARGV[2])
end
if ARGV[7] == 'persist' then redis.call('PERSIST', KEYS[1])
elseif ARGV[7] == 'expire' then redis.call('EXPIRE', KEYS[1], ARGV[8]) end
if ARGV[3] ~= '' then
  redis.call('SADD', KEYS[4], ARGV[3])
  redis.call('EXPIRE', KEYS[4], ARGV[8])
end
return 1
"""

# A control for a task not journaled yet: kept (ARGV[1] 'set') or withdrawn ('clear') until
# the task arrives. Returns 'exists' (the workflow arrived meanwhile), 'duplicate' or 'ok'.
PENDING_CONTROL = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 'exists' end
if redis.call('SISMEMBER', KEYS[3], ARGV[2]) == 1 then return 'duplicate' end
if ARGV[1] == 'set' then
  redis.call('HSET', KEYS[2], 'action', ARGV[3], 'actor', ARGV[4], 'reason', ARGV[5],
    'control_id', ARGV[2])
  redis.call('EXPIRE', KEYS[2], ARGV[6])
else
  redis.call('DEL', KEYS[2])
end
redis.call('SADD', KEYS[3], ARGV[2])
redis.call('EXPIRE', KEYS[3], ARGV[6])
return 'ok'
"""
