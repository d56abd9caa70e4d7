"""Trace replay: real cluster traces through the real collector and analyzer processes.

Two replays, each in its own namespace with its own collector and analyzer processes on the
real broker and Redis, driven by an in-process simulated fleet (bench/fleet_sim.py) that
speaks the real protocol (registered nodes, strict reports, signed probes answered):

* philly: the Philly per-minute busy/total GPU node series (Microsoft Philly trace, CC BY
  4.0, as published per minute by the Helios authors in S-Lab-System-Group/HeliosArtifact,
  MIT). A fleet of --nodes nodes (scaled down from the trace's `total`) is kept busy in the
  trace's `active/total` proportion minute by minute: busy nodes report --busy-pct GPU
  utilisation, idle ones --idle-pct (each node with a fixed offset of up to +/- --jitter-pct);
  busy nodes report one whole-node gang job, as Philly's are (--jobs to change it).
  Counts the scale_out / scale_in / load_balance needs and the trace minute each was raised
  in, beside the pool utilisation the analyzer published.
* titan: GPU failure events of ORNL's Titan (derived from olcf/TitanGPULife, data of
  Ostrouchov et al., "GPU Lifetimes on Titan Supercomputer: Survival Analysis and
  Reliability", SC '20; please cite it). Each event of the window is injected on the
  simulated node of the same name, time-compressed, for --fault-reports reports: a DBE
  (double-bit ECC error) as XID 48 plus an uncorrected ECC error, an OTB (GPU off the bus)
  as XID 79. Counts the offline needs raised against the failures injected, and the delay
  from injection to need (p50/p99).

Time is compressed; report timestamps stay real (the collector's clock checks pass), and the
analyzer's hold periods and open-need lifetime are scaled by the same factor through its
environment (ANALYZER_*__HOLD_S, ANALYZER_OPEN_NEED_TTL_S). Every process started here is
stopped on exit, on SIGTERM and on errors. Run: `python -m bench.trace_replay` (see --help);
figures go to docs/benchmarks.md.

The parts: `traces` (reading the two traces), `figures` (pure arithmetic on what was seen),
`stack` (the namespace, its services and the taps on their output), `philly` and `titan`
(the two replays) and `__main__` (the command line).
"""
