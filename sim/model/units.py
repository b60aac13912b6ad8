"""Unit constants. Decimal SI for rates and sizes; binary units only where a source states them."""

KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12

KiB = 2**10
MiB = 2**20
GiB = 2**30

US = 1e-6  # seconds in a microsecond
MS = 1e-3  # seconds in a millisecond

TFLOP = 1e12

# Named unitless factors used by the physics.
KV_TENSORS = 2  # one K and one V tensor per layer
FLOP_PER_MAC = 2  # a multiply-accumulate is two floating-point operations
ATTN_MATMULS = 2  # decode attention: QK^T and softmax(QK^T)V

PERCENT = 100  # fractions shown as percentages
