"""Beam search: the parameters and outputs (`params`), the pure bookkeeping of
candidates and hypotheses (`search`), and the engine's side of it (`group`):
a request's live beams are sequences of one `SequenceGroup`, advanced in the
engine's packed step and sharing their KV blocks copy-on-write.
"""
