"""The building blocks models compose: projections, embedding and lm_head, norm, rotary,
activation and paged attention.

Each layer owns its parameters and loads them from checkpoint tensors itself (`weight_loader`), so
how a weight is split across devices, or what an adapter adds to a projection, is decided in one
layer class rather than in every model or in the loader. Elementwise layers run a fused Triton
kernel on CUDA tensors and the plain torch form elsewhere; the torch forms keep transformers' order
of operations, so CPU outputs match it exactly, and the kernels compute in float32 and round once
(checked against the same references in tests/kernels).
"""
