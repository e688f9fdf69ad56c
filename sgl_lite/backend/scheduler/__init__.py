"""One step's decisions: which tokens a pass computes, what each request gets from it.

The scheduler batches requests, the sampler turns logits into tokens, the output processor
applies them (grammar, text, finish). Nothing here runs the model or holds KV tensors.
"""
