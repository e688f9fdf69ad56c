"""Tensors: the model runner, the model families, weight formats and the decode fast paths.

`ModelRunner` turns a list of `Segment`s into logits; it knows nothing about requests.
"""
