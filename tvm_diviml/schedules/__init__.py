"""Default CPU schedules: the library floor that turns TVM's unscheduled llvm kernels into
parallel, vectorized, register-tiled loops (TVM 0.27 schedules none; dlight's CPU rules cover only
GEMV and reductions). Uses TVM; the solvers and the simulator never import it.

  ``target``    the TVM target a platform device compiles for (host ``mcpu``, ``num-cores`` = threads)
  ``analysis``  what every rule asks of a kernel: its contraction, how inputs are read, the CPU's facts
  ``tiling``    the register-tiled vector reduction (conv, pooling, matmul) and injective loops
  ``rules``     one rule per kernel class in dlight's form, tried in order, a fallback last
  ``apply``     every kernel of a module scheduled, each marked with its rule; the rules' cache digest
"""
