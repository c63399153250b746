"""What the solvers are built from (TVM-free; imports nothing from ``solvers/`` or ``bounds/``).

Exact models (python-mip, HiGHS or CBC):
  ``mip_backend``       the backend every MIP and LP shares, gaps and time limits, the no-plan error
  ``latency_model``     the latency MILP (makespan, per-edge transfers, order variables)
  ``throughput_model``  the ``period_overlap`` throughput MILP (device and link loads, price layers)
  ``throughput_exact``  the throughput MILP as a step of other solvers, warm-started, with its bound
  ``pipeline_model``    MTPP in ids: block costs, price layers, the exact pipeline MIP
  ``windows``           a window of kernels solved with the rest of the graph fixed
  ``window_solver``     latency windows solved in turn (CP-SAT or the MILP) within one deadline, and
                        what they are cut from: fixed kernels, tails, start orders (split's latency)
  ``split_throughput``  split's throughput: modules, then sweeps, of throughput-MILP windows
  ``memory``            the exact models' activation reserve and the kernel sets seen to overflow
CP-SAT (OR-Tools, in a subprocess of its own: OR-Tools and CBC clash in one process):
  ``cpsat_session``     tick models of latency windows, one worker process for many solves
  ``cpsat_worker``      that process, run by path
Dynamic programs:
  ``series``            cut kernels, and the latency DP over their devices (exact and as a bound)
  ``downsets``          the DP over ideals: msr-fiddle max load and exact pipelines
  ``stage_costs``       every interval of a topological order priced at once (numpy), for SliceGraph
  ``pipeline_polish``   a pipeline improved by the downset DP: windows of stages, cuts along orders
List schedules and quick plans:
  ``list_scheduling``   greedy, HEFT, the throughput greedy
  ``single_device``     the whole model on each device: every report's baseline
  ``heuristics``        the best quick plan: warm starts and fallbacks
  ``constraints``       memory, allowed devices and co-location, kept while heuristics place
Structure of the graph:
  ``communities``, ``louvain``  split's modules (modularity communities, exact gains)
  ``blocks``            repeated blocks (transformer layers), for the symmetric solver
  ``device_classes``    identical devices as one class; interchangeable ones beyond the kernel count dropped
  ``solvable``          the problem solvers and bounds model: spare devices gone, prices in range
Time and progress:
  ``deadline``          one wall-clock end per solve, handed to every sub-solve; OutOfTime past it
  ``incumbents``        the best plan and bound of a solve as they improve (progress, Ctrl-C's result)
"""
