"""Data-free quantization: what bnfold does after folding to prepare int8 weights.

    region.py      the ops between two layers, walked through bnfold.laws
    statistics.py  a folded batch norm's statistics (gamma, beta, mean, variance)
    equalize.py    cross-layer equalization (pattern `equalize`)
    high_bias.py   high-bias absorption (pattern `absorb-high-bias`)

Imported only when a run asks for it (the registry loads patterns lazily).
"""
