"""The router's core: prefix index, worker view, placement plugins, conditional disaggregation and
admission.

Everything here is pure Python with no network I/O, so a thin gRPC servicer (and the tests) can
drive it directly; `router.Router` is the facade.
"""
