"""Measuring on this machine: the floor between the compiler passes and the application.

``profile(graph, platform, model, extraction, ...)`` measures a model's costs and returns them as the
TVM-free ``cost.TableCostModel`` that plans (its ``provenance`` says how each figure was made). The
modules, each timing something with TVM and handing figures on:

  ``profiler``       ``profile``: the schedules chosen, the figures measured, the table built from them
  ``measured``       kernels timed per target (cached), links timed and fitted, the executor's overheads
  ``tuning``         MetaSchedule searches whose databases the builds then apply
  ``cache``          the SQLite profile cache that makes a second run of a model time nothing
  ``overheads``      the concurrent executor's own costs: hand-offs, segment calls, co-run slow-down
  ``rpc_hops``       what a hop between RPC servers costs, timed on the servers themselves
  ``timing``         plans built and timed: the in-context calibration, single-device configurations,
                     candidates side by side
  ``candidates``     the candidate plans worth building, and the choice of the fastest measured
  ``fallback_time``  kernels only the fallback schedule took that cost much of the model's time
"""


def __getattr__(name: str):
    if name == "profile":
        # TVM enters here: the package itself loads none (the command line reads the cache's location)
        from .profiler import profile

        return profile
    raise AttributeError(f"module 'tvm_diviml.profiling' has no attribute '{name}'")
