"""KV memory: the token-slot pool, the radix tree over it, and the one place slots change hands.

`KVPool` holds the tensors and a free list, `RadixCache` only slot ids, `CacheManager` moves
slots between them and the running requests; `sizing` says how big the pool can be.
"""
