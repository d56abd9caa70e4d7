#!/usr/bin/env bash
# Runs a single-node Apache Kafka (KRaft, combined broker+controller) for local development and
# integration tests, straight from the jars that deploy/kafka/pom.xml fetches. No Docker needed.
#
#   deploy/local/kafka.sh start    start (or confirm already running) and wait until it serves metadata
#   deploy/local/kafka.sh stop     SIGTERM, wait up to 30 s for a clean shutdown, then SIGKILL
#   deploy/local/kafka.sh status   exit 0 if running and accepting connections, 1 otherwise
#   deploy/local/kafka.sh reset    stop and delete the data dir (the next start formats afresh)
#   deploy/local/kafka.sh env P    (secured broker) print the exports that connect as principal P
#   deploy/local/kafka.sh provision [NS]
#                                  (secured broker) create namespace NS's topics and ACLs
#
# Secured (docs/security.md): `start --secure`, or KAFKA_SECURITY=sasl_ssl for every command,
# runs the broker with one SASL_SSL (SCRAM-SHA-512) client listener instead of PLAINTEXT, the
# StandardAuthorizer refusing whatever no ACL allows, and a user per principal of
# schemas/access.py. The first start makes a CA and the broker's certificate, the passwords and
# the users; every start then creates the production topics and the ACL table's rules. Its state
# (data, certificates, passwords) lives apart, in $WARDEN_STATE_DIR/kafka-secure, so the two
# brokers can run side by side on different ports.
#
# Mutual TLS (docs/security.md): `start --mtls`, or KAFKA_SECURITY=mtls for every command, runs
# the same broker with one SSL client listener that requires a client certificate instead
# (ssl.client.auth=required). The script's CA signs a certificate per principal (CN=<principal>)
# and ssl.principal.mapping.rules turns it into User:<principal>, so the same ACLs apply. Its
# state lives in $WARDEN_STATE_DIR/kafka-mtls, apart from both others.
#
# Environment:
#   WARDEN_STATE_DIR        state root (default <repo>/.state); this script uses $WARDEN_STATE_DIR/kafka
#   KAFKA_PORT              client (PLAINTEXT) port, default 19092
#   KAFKA_CONTROLLER_PORT   KRaft controller port, default 19093
#   KAFKA_SECURITY          plaintext (default), sasl_ssl or mtls
# Both ports bind 127.0.0.1 only and sit away from 9092/9093 so a system Kafka does not collide.
set -euo pipefail

MODE="${KAFKA_SECURITY:-plaintext}"
case "${MODE}" in
    plaintext | sasl_ssl | mtls) ;;
    *) printf 'kafka: error: KAFKA_SECURITY is %s, not plaintext, sasl_ssl or mtls\n' "${MODE}" >&2; exit 2 ;;
esac
case "${2:-}" in
    --secure) MODE=sasl_ssl; set -- "$1" "${@:3}" ;;
    --mtls) MODE=mtls; set -- "$1" "${@:3}" ;;
esac
# SECURE: either secured broker (ACLs, a principal per service, provisioning); MTLS: the one
# whose principals are client certificates rather than SCRAM users.
SECURE=0
MTLS=0
[[ "${MODE}" == plaintext ]] || SECURE=1
if [[ "${MODE}" == mtls ]]; then MTLS=1; fi

case "${MODE}" in
    plaintext) COMPONENT=kafka ;;
    sasl_ssl) COMPONENT=kafka-secure ;;
    mtls) COMPONENT=kafka-mtls ;;
esac
# shellcheck source=deploy/local/common.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/common.sh"

KAFKA_HOST=127.0.0.1
KAFKA_PORT="${KAFKA_PORT:-19092}"
KAFKA_CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-19093}"
STATE_DIR="${STATE_ROOT}/${COMPONENT}"
SECRETS_DIR="${STATE_DIR}/secrets"
CA_CERT="${SECRETS_DIR}/ca.pem"
ADMIN=admin
DATA_DIR="${STATE_DIR}/data"
LOGS_DIR="${STATE_DIR}/logs"
SERVER_PROPS="${STATE_DIR}/server.properties"
LOG4J_PROPS="${STATE_DIR}/log4j2.properties"
PID_FILE="${STATE_DIR}/kafka.pid"
CLUSTER_ID_FILE="${STATE_DIR}/cluster.id"
STDOUT_LOG="${LOGS_DIR}/kafka.out"
SERVER_LOG="${LOGS_DIR}/server.log"

POM="${REPO_ROOT}/deploy/kafka/pom.xml"
LIBS_DIR="${REPO_ROOT}/deploy/kafka/target/libs"

READY_TIMEOUT_S=90
STOP_TIMEOUT_S=30
# How long start/stop waits for another run of this script (take_lock, common.sh).
LOCK_WAIT_S=$(( READY_TIMEOUT_S + STOP_TIMEOUT_S ))


usage() {
    printf 'usage: %s {start [--secure|--mtls]|stop|status|reset|env PRINCIPAL|provision [NAMESPACE]}\n' "$0" >&2
    exit 2
}

require_java() {
    command -v java >/dev/null 2>&1 \
        || die "java not found on PATH; Kafka 4.x needs a Java 17+ runtime (e.g. apt-get install -y openjdk-17-jre-headless)"
    # Kafka 4.x brokers refuse to run on anything older than Java 17; say so up front instead of
    # letting the JVM fail with an UnsupportedClassVersionError buried in kafka.out.
    local spec
    spec="$(java -XshowSettings:properties -version 2>&1 | awk -F'= ' '/java.specification.version/ { print $2; exit }')"
    if [[ ! "${spec}" =~ ^[0-9]+$ ]] || (( spec < 17 )); then
        die "java on PATH reports specification version '${spec:-unknown}'; Kafka 4.x needs Java 17+"
    fi
}

have_kafka_jars() {
    compgen -G "${LIBS_DIR}/kafka_2.13-*.jar" >/dev/null
}

ensure_libs() {
    have_kafka_jars && return 0
    command -v mvn >/dev/null 2>&1 \
        || die "${LIBS_DIR} has no kafka_2.13-*.jar and mvn is not on PATH to fetch it; install Maven (apt-get install -y maven) or run: mvn -B -q -f ${POM} package"
    log "fetching Kafka jars with Maven (one-off) ..."
    # Output goes to a file: even -B -q leaves stray ANSI resets on the terminal with Maven 3.8.
    local mvn_log="${LOGS_DIR}/mvn.log"
    if ! mvn -B -q -f "${POM}" package >"${mvn_log}" 2>&1; then
        tail -n 40 "${mvn_log}" >&2
        die "mvn -B -q -f ${POM} package failed (full output in ${mvn_log})"
    fi
    have_kafka_jars || die "mvn succeeded but ${LIBS_DIR} still has no kafka_2.13-*.jar"
}

# True if something accepts TCP connections on host:port. Uses bash's /dev/tcp so polling does
# not fork a new interpreter every iteration; `timeout` bounds a connect that hangs.
port_open() {
    # shellcheck disable=SC2016  # $1/$2 are expanded by the inner bash, not this one
    timeout 1 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$1" "$2" 2>/dev/null
}

# True if the broker answers a metadata request with at least one broker in it. An open port alone
# is not enough to call the broker usable, so ask it for metadata the way a client would. aiokafka
# is the client the services use, so prefer it; without it, send a hand-built Metadata v0 request.
broker_answers() {
    if (( SECURE )); then
        secure_broker_answers
        return
    fi
    python3 - "${KAFKA_HOST}" "${KAFKA_PORT}" <<'PY' >/dev/null 2>&1
import asyncio
import socket
import struct
import sys

host, port = sys.argv[1], int(sys.argv[2])


async def via_aiokafka() -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=f"{host}:{port}", request_timeout_ms=5000)
    await admin.start()
    try:
        await admin.list_topics()
    finally:
        await admin.close()


def via_raw_metadata() -> None:
    client_id = b"warden-ready-check"
    # Request header v1 (api_key=3 Metadata, version 0, correlation id, client id) and an empty
    # topic array, which Metadata v0 reads as "all topics".
    body = struct.pack(">hhih", 3, 0, 7, len(client_id)) + client_id + struct.pack(">i", 0)
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        buf = b""
        while len(buf) < 12:
            chunk = sock.recv(4096)
            if not chunk:
                raise ConnectionError("broker closed the connection")
            buf += chunk
    _size, correlation_id, broker_count = struct.unpack(">iii", buf[:12])
    if correlation_id != 7 or broker_count < 1:
        raise RuntimeError("unexpected metadata response")


try:
    import aiokafka  # noqa: F401
except ImportError:
    via_raw_metadata()
else:
    asyncio.run(asyncio.wait_for(via_aiokafka(), timeout=10))
PY
}

# The principals of the access table (schemas/access.py), admin among them.
principals() {
    PYTHONPATH="${REPO_ROOT}" "${VENV_PY}" -c 'from schemas.access import Principal; print(*Principal, sep="\n")'
}

password_file() { printf '%s/%s.password' "${SECRETS_DIR}" "$1"; }

# A CA, the broker's certificate (for 127.0.0.1 and localhost) in a PKCS12 keystore, and (SCRAM)
# a random password per principal; made once, kept across restarts and `reset`.
make_secrets() {
    [[ -f "${SECRETS_DIR}/broker.p12" ]] && return 0
    command -v openssl >/dev/null 2>&1 || die "openssl not found on PATH (apt-get install -y openssl)"
    log "making a CA, the broker's certificate and the principals' credentials in ${SECRETS_DIR} ..."
    mkdir -p "${SECRETS_DIR}"
    chmod 700 "${SECRETS_DIR}"
    local name
    ( umask 077
      if (( ! MTLS )); then
          while read -r name; do
              head -c 24 /dev/urandom | base64 | tr -d '/+=\n' >"$(password_file "${name}")"
          done < <(principals)
      fi
      head -c 24 /dev/urandom | base64 | tr -d '/+=\n' >"${SECRETS_DIR}/keystore.password"
      openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=ClusterWarden local CA" \
          -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
          -keyout "${SECRETS_DIR}/ca.key" -out "${CA_CERT}"
      openssl req -newkey rsa:2048 -nodes -subj "/CN=${KAFKA_HOST}" \
          -keyout "${SECRETS_DIR}/broker.key" -out "${SECRETS_DIR}/broker.csr"
      printf 'subjectAltName=IP:%s,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n' \
          "${KAFKA_HOST}" >"${SECRETS_DIR}/broker.ext"
      openssl x509 -req -days 825 -in "${SECRETS_DIR}/broker.csr" -CA "${CA_CERT}" \
          -CAkey "${SECRETS_DIR}/ca.key" -CAcreateserial -extfile "${SECRETS_DIR}/broker.ext" \
          -out "${SECRETS_DIR}/broker.pem"
      openssl pkcs12 -export -name broker -in "${SECRETS_DIR}/broker.pem" \
          -inkey "${SECRETS_DIR}/broker.key" -certfile "${CA_CERT}" \
          -passout "file:${SECRETS_DIR}/keystore.password" -out "${SECRETS_DIR}/broker.p12"
    ) >>"${LOGS_DIR}/openssl.log" 2>&1 || die "openssl failed (see ${LOGS_DIR}/openssl.log)"
    chmod 644 "${CA_CERT}"
}

# The subject of a principal's client certificate ends in this OU and O, and the broker's
# mapping rule (listener_props) demands both, so a certificate with a bare CN (the broker's
# own) never passes for a principal.
CLIENT_SUBJECT_TAIL="OU=kafka-client,O=ClusterWarden"
client_cert() { printf '%s/%s.pem' "${SECRETS_DIR}" "$1"; }
client_key() { printf '%s/%s.key' "${SECRETS_DIR}" "$1"; }

# (mTLS) A client certificate per principal (CN=<principal>), signed by the CA of make_secrets,
# with its key (mode 600). Only the missing ones are made, so a principal added to
# schemas/access.py gets its certificate on the next start while the others stay as they are.
make_client_certs() {
    local name made=0
    while read -r name; do
        [[ -f "$(client_cert "${name}")" ]] && continue
        ( umask 077
          openssl req -newkey rsa:2048 -nodes -subj "/O=ClusterWarden/OU=kafka-client/CN=${name}" \
              -keyout "$(client_key "${name}")" -out "${SECRETS_DIR}/${name}.csr"
          printf 'extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n' \
              >"${SECRETS_DIR}/client.ext"
          openssl x509 -req -days 825 -in "${SECRETS_DIR}/${name}.csr" -CA "${CA_CERT}" \
              -CAkey "${SECRETS_DIR}/ca.key" -CAcreateserial -extfile "${SECRETS_DIR}/client.ext" \
              -out "$(client_cert "${name}")"
          rm -f "${SECRETS_DIR}/${name}.csr"
        ) >>"${LOGS_DIR}/openssl.log" 2>&1 \
            || { rm -f "$(client_cert "${name}")"; die "openssl failed for principal ${name} (see ${LOGS_DIR}/openssl.log)"; }
        chmod 644 "$(client_cert "${name}")"
        made=$(( made + 1 ))
    done < <(principals)
    (( made == 0 )) || log "made ${made} client certificate(s) in ${SECRETS_DIR}"
}

# The settings (common/settings.py) that connect as principal $1, one NAME=value per line.
principal_env() {
    if (( MTLS )); then
        [[ -f "$(client_cert "$1")" ]] \
            || die "no principal '$1' (certificates in ${SECRETS_DIR}; the principals are schemas/access.py's)"
        printf '%s\n' "KAFKA_BOOTSTRAP_SERVERS=${KAFKA_HOST}:${KAFKA_PORT}" \
            "KAFKA_SECURITY_PROTOCOL=SSL" "KAFKA_SSL_CAFILE=${CA_CERT}" \
            "KAFKA_SSL_CERTFILE=$(client_cert "$1")" "KAFKA_SSL_KEYFILE=$(client_key "$1")"
        return
    fi
    local file
    file="$(password_file "$1")"
    [[ -f "${file}" ]] || die "no principal '$1' (passwords in ${SECRETS_DIR}; the principals are schemas/access.py's)"
    printf '%s\n' "KAFKA_BOOTSTRAP_SERVERS=${KAFKA_HOST}:${KAFKA_PORT}" \
        "KAFKA_SECURITY_PROTOCOL=SASL_SSL" "KAFKA_SASL_MECHANISM=SCRAM-SHA-512" \
        "KAFKA_SASL_USERNAME=$1" "KAFKA_SASL_PASSWORD=$(<"${file}")" "KAFKA_SSL_CAFILE=${CA_CERT}"
}

# Runs "$@" with the admin's connection settings in its environment.
as_admin() {
    local -a vars
    mapfile -t vars < <(principal_env "${ADMIN}")
    env "${vars[@]}" PYTHONPATH="${REPO_ROOT}" "$@"
}

# The secured broker's readiness: the admin authenticates over TLS and lists the topics.
secure_broker_answers() {
    as_admin "${VENV_PY}" - <<'PY' >/dev/null 2>&1
import asyncio

from aiokafka.admin import AIOKafkaAdminClient

from common.kafka_access import client_options
from common.settings import ServiceSettings


async def main() -> None:
    admin = AIOKafkaAdminClient(**client_options(ServiceSettings()), request_timeout_ms=5000)
    await admin.start()
    try:
        await admin.list_topics()
    finally:
        await admin.close()


asyncio.run(asyncio.wait_for(main(), timeout=10))
PY
}

# Prints the pid from the pid file if that process is alive and really is our broker (pids get
# reused, so a bare `kill -0` could point at an unrelated process after a reboot).
live_pid() {
    [[ -f "${PID_FILE}" ]] || return 1
    local pid
    pid="$(<"${PID_FILE}")"
    [[ "${pid}" =~ ^[0-9]+$ ]] || return 1
    kill -0 "${pid}" 2>/dev/null || return 1
    tr '\0' ' ' <"/proc/${pid}/cmdline" 2>/dev/null | grep -q 'kafka\.Kafka' || return 1
    printf '%s' "${pid}"
}

show_log_tail() {
    if [[ -s "${SERVER_LOG}" ]]; then
        printf -- '--- last 40 lines of %s ---\n' "${SERVER_LOG}" >&2
        tail -n 40 "${SERVER_LOG}" >&2
    fi
    # JVM-level failures (bad flags, missing classes) never reach log4j, only stdout/stderr.
    if [[ -s "${STDOUT_LOG}" ]]; then
        printf -- '--- last 40 lines of %s ---\n' "${STDOUT_LOG}" >&2
        tail -n 40 "${STDOUT_LOG}" >&2
    fi
}

# Kafka cluster ids are 16 random bytes as unpadded base64url (22 chars). Generated once and kept,
# so a reformat after `reset` reuses the same id. A leading '-' is avoided, as Kafka's own
# Uuid.randomUuid does, because the storage tool would parse "-t -abc..." as an option.
cluster_id() {
    local id=""
    if [[ -f "${CLUSTER_ID_FILE}" ]]; then
        id="$(<"${CLUSTER_ID_FILE}")"
        [[ "${id}" =~ ^[A-Za-z0-9_][A-Za-z0-9_-]{21}$ ]] \
            || die "${CLUSTER_ID_FILE} holds '${id}', not a 22-char base64url cluster id; delete it to regenerate"
        printf '%s' "${id}"
        return 0
    fi
    while [[ -z "${id}" || "${id}" == -* ]]; do
        id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
    done
    printf '%s\n' "${id}" >"${CLUSTER_ID_FILE}"
    printf '%s' "${id}"
}

# The broker's TLS identity (make_secrets) and the CA it trusts, for either secured listener.
tls_props() {
    cat <<EOF
ssl.keystore.type=PKCS12
ssl.keystore.location=${SECRETS_DIR}/broker.p12
ssl.keystore.password=$(<"${SECRETS_DIR}/keystore.password")
ssl.key.password=$(<"${SECRETS_DIR}/keystore.password")
ssl.truststore.type=PEM
ssl.truststore.location=${CA_CERT}
ssl.endpoint.identification.algorithm=https
EOF
}

# Whatever no ACL allows is refused. $1: the super users besides the admin.
authorizer_props() {
    cat <<EOF
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:${ADMIN};$1
EOF
}

# The client listener: PLAINTEXT, SASL_SSL with SCRAM-SHA-512, or SSL with a client certificate
# required; the two secured ones with the ACLs enforced.
listener_props() {
    if (( ! SECURE )); then
        cat <<EOF
listeners=PLAINTEXT://${KAFKA_HOST}:${KAFKA_PORT},CONTROLLER://${KAFKA_HOST}:${KAFKA_CONTROLLER_PORT}
advertised.listeners=PLAINTEXT://${KAFKA_HOST}:${KAFKA_PORT}
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
EOF
        return
    fi
    if (( MTLS )); then
        cat <<EOF
# Clients authenticate with a certificate of this script's CA; the controller listener stays
# PLAINTEXT on loopback (only this node's broker half talks to it).
listeners=SSL://${KAFKA_HOST}:${KAFKA_PORT},CONTROLLER://${KAFKA_HOST}:${KAFKA_CONTROLLER_PORT}
advertised.listeners=SSL://${KAFKA_HOST}:${KAFKA_PORT}
listener.security.protocol.map=SSL:SSL,CONTROLLER:PLAINTEXT
inter.broker.listener.name=SSL
ssl.client.auth=required
# CN=<principal>,${CLIENT_SUBJECT_TAIL} (a principal's certificate) is User:<principal>, the
# name its ACLs use; any other subject, the broker's own among them, stays its full DN.
ssl.principal.mapping.rules=RULE:^CN=([a-zA-Z0-9._-]+),${CLIENT_SUBJECT_TAIL}\$/\$1/,DEFAULT
$(tls_props)

# The admin's certificate is the super user; so are the broker's own (User:CN=${KAFKA_HOST},
# its inter-broker connections) and ANONYMOUS, the broker half reaching the controller over its
# loopback PLAINTEXT listener, which no client can use for data (it serves only KRaft).
$(authorizer_props "User:CN=${KAFKA_HOST};User:ANONYMOUS")
EOF
        return
    fi
    cat <<EOF
# Clients authenticate with SCRAM-SHA-512 over TLS; the controller listener stays PLAINTEXT on
# loopback (only this node's broker half talks to it).
listeners=SASL_SSL://${KAFKA_HOST}:${KAFKA_PORT},CONTROLLER://${KAFKA_HOST}:${KAFKA_CONTROLLER_PORT}
advertised.listeners=SASL_SSL://${KAFKA_HOST}:${KAFKA_PORT}
listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT
inter.broker.listener.name=SASL_SSL
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="${ADMIN}" password="$(<"$(password_file "${ADMIN}")")";
$(tls_props)

# The admin (topics, users, ACLs) is the super user; ANONYMOUS is the broker half reaching the
# controller over its loopback PLAINTEXT listener, which no client can use for data (it serves
# only the KRaft protocol).
$(authorizer_props "User:ANONYMOUS")
EOF
}

write_configs() {
    # Regenerated on every start so that changed ports or settings here take effect; nothing in
    # these files is state worth preserving. The secured broker's holds the broker's passwords.
    ( umask 077; : >"${SERVER_PROPS}" )
    cat >"${SERVER_PROPS}" <<EOF
# Generated by deploy/local/kafka.sh on every start; edit the script, not this file.
# Single combined broker+controller KRaft node.
process.roles=broker,controller
node.id=1
# Static quorum of one voter. Kafka 4.4 still formats and runs this without --standalone; the
# dynamic-quorum alternative (controller.quorum.bootstrap.servers + format --standalone) is only
# needed to add or remove controllers later, which a one-node dev broker never does.
controller.quorum.voters=1@${KAFKA_HOST}:${KAFKA_CONTROLLER_PORT}
$(listener_props)
controller.listener.names=CONTROLLER
log.dirs=${DATA_DIR}

# One broker: every internal topic must make do with replication 1, and one partition keeps
# start-up (and coordinator loading) fast.
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1

# Tests start consumers and expect them to get partitions immediately.
group.initial.rebalance.delay.ms=0
# The services create their topics explicitly; a typo must fail loudly rather than make a topic.
auto.create.topics.enable=false

num.network.threads=2
num.io.threads=2
log.retention.hours=24
EOF

    cat >"${LOG4J_PROPS}" <<'EOF'
# Generated by deploy/local/kafka.sh. Everything goes to one rolling file at INFO; nothing to the
# console, so kafka.out only ever holds JVM-level errors.
status = warn
name = warden-local-kafka

appender.server.type = RollingFile
appender.server.name = server
appender.server.fileName = ${sys:kafka.logs.dir}/server.log
appender.server.filePattern = ${sys:kafka.logs.dir}/server.log.%i
appender.server.layout.type = PatternLayout
appender.server.layout.pattern = [%d] %p %m (%c)%n
appender.server.policies.type = Policies
appender.server.policies.size.type = SizeBasedTriggeringPolicy
appender.server.policies.size.size = 50MB
appender.server.strategy.type = DefaultRolloverStrategy
appender.server.strategy.max = 3

rootLogger.level = INFO
rootLogger.appenderRef.server.ref = server

# Per-request logging is only useful when debugging the protocol itself.
logger.request.name = kafka.request.logger
logger.request.level = WARN
EOF
}

format_storage() {
    # meta.properties exists once the log dir is formatted; skipping the tool then saves a JVM
    # start on every warm restart. --ignore-formatted keeps it safe if this check ever misses.
    [[ -f "${DATA_DIR}/meta.properties" ]] && return 0
    local id
    id="$(cluster_id)"
    log "formatting ${DATA_DIR} (cluster id ${id}) ..."
    # The secured broker's users are written into the metadata at format time, so they exist
    # before the broker first accepts a connection (the admin among them).
    local -a users=()
    if (( SECURE && ! MTLS )); then
        local name
        while read -r name; do
            users+=(--add-scram "SCRAM-SHA-512=[name=${name},password=$(<"$(password_file "${name}")")]")
        done < <(principals)
    fi
    java -Xmx256m -Dlog4j2.configurationFile="${LOG4J_PROPS}" -Dkafka.logs.dir="${LOGS_DIR}" \
        -cp "${LIBS_DIR}/*" kafka.tools.StorageTool format \
        -t "${id}" -c "${SERVER_PROPS}" --ignore-formatted "${users[@]}" >>"${STDOUT_LOG}" 2>&1 \
        || { show_log_tail; die "formatting the storage directory failed"; }
}

wait_until_ready() {
    local pid="$1" started="$2"
    local deadline
    deadline="$(awk -v s="${started}" -v t="${READY_TIMEOUT_S}" 'BEGIN { printf "%d", s + t }')"
    while :; do
        if ! kill -0 "${pid}" 2>/dev/null; then
            rm -f "${PID_FILE}"
            show_log_tail
            die "broker process ${pid} exited during start-up"
        fi
        # The cheap TCP probe (no fork of an interpreter) gates the metadata check, so Python
        # only runs once the client listener is actually accepting connections.
        if port_open "${KAFKA_HOST}" "${KAFKA_PORT}" && broker_answers; then
            return 0
        fi
        if (( EPOCHSECONDS >= deadline )); then
            show_log_tail
            die "broker not ready on ${KAFKA_HOST}:${KAFKA_PORT} after ${READY_TIMEOUT_S} s (pid ${pid} still running; see ${LOGS_DIR})"
        fi
        sleep 0.2
    done
}

cmd_start() {
    local started pid
    started="$(now)"
    mkdir -p "${DATA_DIR}" "${LOGS_DIR}"

    if pid="$(live_pid)"; then
        if port_open "${KAFKA_HOST}" "${KAFKA_PORT}" && broker_answers; then
            log "already running (pid ${pid}) on ${KAFKA_HOST}:${KAFKA_PORT}"
            return 0
        fi
        # Ours but not answering: an earlier `start` was interrupted before the broker became
        # ready, or it is still recovering its logs. Wait for it rather than start a second one.
        log "pid ${pid} is running but not answering yet; waiting for it"
        wait_until_ready "${pid}" "${started}"
        log "kafka ready on ${KAFKA_HOST}:${KAFKA_PORT} in $(elapsed_since "${started}") s"
        return 0
    fi
    rm -f "${PID_FILE}"

    # Refuse to start over someone else's listener: the broker would die with a bind error, and
    # worse, the readiness check could succeed against the foreign process.
    local port
    for port in "${KAFKA_PORT}" "${KAFKA_CONTROLLER_PORT}"; do
        if port_open "${KAFKA_HOST}" "${port}"; then
            die "${KAFKA_HOST}:${port} is already in use by a process this script did not start; stop it or set KAFKA_PORT/KAFKA_CONTROLLER_PORT"
        fi
    done

    require_java
    ensure_libs
    if (( SECURE )); then
        require_venv
        make_secrets
    fi
    if (( MTLS )); then
        make_client_certs
    fi
    write_configs
    format_storage

    # nohup + redirected stdio so the broker outlives this shell and never writes to the terminal.
    # fd 9 (the lock) is closed for the broker, or it would hold the lock for as long as it runs.
    # Heap (KAFKA_HEAP, default 1g, Kafka's own default): a test run creates a namespace of
    # topics per test, thousands of partitions in all; 512m ran out with a few hundred
    # namespaces (tests now delete theirs, see tests/integration/harness.py).
    # log4j2's own shutdown hook races Kafka's: it stopped logging before Kafka had finished
    # shutting down, so the last shutdown lines went to kafka.out as "Unable to register Log4j
    # shutdown hook ... Using SimpleLogger". Without the hook logging lasts until the JVM exits;
    # nothing is lost because the file appender flushes every line.
    nohup java -Xms"${KAFKA_HEAP:-1g}" -Xmx"${KAFKA_HEAP:-1g}" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
        -Djava.awt.headless=true \
        -Dlog4j2.shutdownHookEnabled=false \
        -Dlog4j2.configurationFile="${LOG4J_PROPS}" \
        -Dkafka.logs.dir="${LOGS_DIR}" \
        -cp "${LIBS_DIR}/*" kafka.Kafka "${SERVER_PROPS}" \
        >>"${STDOUT_LOG}" 2>&1 </dev/null 9>&- &
    pid=$!
    printf '%s\n' "${pid}" >"${PID_FILE}"
    log "started pid ${pid}; waiting up to ${READY_TIMEOUT_S} s for ${KAFKA_HOST}:${KAFKA_PORT} ..."

    wait_until_ready "${pid}" "${started}"
    log "kafka ready on ${KAFKA_HOST}:${KAFKA_PORT} in $(elapsed_since "${started}") s"
    if (( SECURE )); then
        cmd_provision ""
    fi
}

# The setup step of the secured broker: namespace $1's topics and the ACL table's rules.
cmd_provision() {
    (( SECURE )) || die "provision is for a secured broker (KAFKA_SECURITY=sasl_ssl or mtls)"
    require_venv
    as_admin "${VENV_PY}" -m common.kafka_provision --namespace "$1" >/dev/null \
        || die "creating the topics and ACLs of namespace '$1' failed"
    log "topics and ACLs of namespace '$1' in place"
}

cmd_env() {
    (( SECURE )) || die "env is for a secured broker (KAFKA_SECURITY=sasl_ssl or mtls)"
    # Taken whole first: a `done < <(...)` would swallow principal_env's exit status, and an
    # unknown principal would print nothing and still succeed.
    local lines line
    lines="$(principal_env "$1")"
    while read -r line; do
        printf 'export %q\n' "${line}"
    done <<<"${lines}"
}

cmd_stop() {
    local pid
    if ! pid="$(live_pid)"; then
        rm -f "${PID_FILE}"
        log "not running"
        return 0
    fi
    local started
    started="$(now)"
    # SIGTERM runs Kafka's shutdown hook: it flushes logs and writes clean-shutdown markers, which
    # spares the next start a log recovery pass.
    kill -TERM "${pid}" 2>/dev/null || true
    wait_exit "${pid}" "${STOP_TIMEOUT_S}" \
        || kill_hard "${pid}" "still alive after ${STOP_TIMEOUT_S} s"
    rm -f "${PID_FILE}"
    log "stopped pid ${pid} in $(elapsed_since "${started}") s"
}

cmd_status() {
    local pid
    if pid="$(live_pid)" && port_open "${KAFKA_HOST}" "${KAFKA_PORT}"; then
        log "running (pid ${pid}) on ${KAFKA_HOST}:${KAFKA_PORT}"
        return 0
    fi
    if [[ -n "${pid:-}" ]]; then
        log "pid ${pid} is alive but ${KAFKA_HOST}:${KAFKA_PORT} is not accepting connections"
    else
        log "not running"
    fi
    return 1
}


cmd_reset() {
    cmd_stop
    # Only the data dir goes: logs stay for post-mortems and the cluster id is reused on reformat.
    rm -rf "${DATA_DIR}"
    log "deleted ${DATA_DIR}"
}

main() {
    [[ $# -ge 1 ]] || usage
    validate_port KAFKA_PORT "${KAFKA_PORT}"
    validate_port KAFKA_CONTROLLER_PORT "${KAFKA_CONTROLLER_PORT}"
    [[ "${KAFKA_PORT}" != "${KAFKA_CONTROLLER_PORT}" ]] \
        || die "KAFKA_PORT and KAFKA_CONTROLLER_PORT must differ"
    case "$1" in
        start) [[ $# -eq 1 ]] || usage; take_lock "${LOCK_WAIT_S}"; cmd_start ;;
        env) [[ $# -eq 2 ]] || usage; cmd_env "$2" ;;
        provision) [[ $# -le 2 ]] || usage; cmd_provision "${2:-}" ;;
        stop) take_lock "${LOCK_WAIT_S}"; cmd_stop ;;
        status) cmd_status ;;
        reset) take_lock "${LOCK_WAIT_S}"; cmd_reset ;;
        *) usage ;;
    esac
}

main "$@"
