"""Measuring on this machine: the floor between the compiler passes and the application.

Everything here times something with TVM and hands the figures to a TVM-free cost model:

  ``measured``       kernels timed per target (cached), links timed and fitted, the in-context calibration
  ``tuning``         MetaSchedule searches whose databases the builds then apply
  ``cache``          the SQLite profile cache that makes a second run of a model time nothing
  ``overheads``      the concurrent executor's own costs: hand-offs, segment calls, co-run slow-down
  ``rpc_hops``       what a hop between RPC servers costs, timed on the servers themselves
  ``timing``         plans built and timed: single-device configurations, candidates side by side
  ``candidates``     the candidate plans worth building, and the choice of the fastest measured
  ``fallback_time``  kernels only the fallback schedule took that cost much of the model's time
"""
