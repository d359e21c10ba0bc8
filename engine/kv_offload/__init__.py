"""The host-memory tier of the prefix cache: evicted device blocks kept in host memory, loaded back on a hit.

When the device pool hands out a cached block that no sequence references
(its content about to be overwritten), the tier takes a host block, registers
the device block's hash on it and asks the runner to copy the content device
-> host before the step's forward. A later prefix lookup that misses on the
device but finds the hash in the tier allocates a device block, registers the
hash there and asks for the copy host -> device, instead of recomputing it.

One host allocator, one budget: the tier lives in the host pool the swap
space already uses (`KVCacheManager.host`, one `BlockPool` of medium "CPU"
over the runner's one host tensor). Its size is swap_space (in swap mode)
plus kv_offloading_size. A swapped-out sequence references its host blocks;
the tier's entries are the host pool's free blocks that keep a hash, evicted
least recently stored first when either the tier or a swap-out needs a block.
So swapping never fails for the tier's sake, and the tier uses every host
block no swapped sequence holds.

Invariants (`OffloadTier.check_invariants`, the scheduler's state machine):
- a hash is cached in at most one of the device pool and the tier (moves are
  exclusive: stored -> dropped from the device; loaded -> dropped from the tier);
- a host block with a hash is free (ref_cnt 0): swapped and held blocks have none;
- the host pool's blocks are exactly: free, referenced by swapped tables, or
  held until the next step (`holds`); nothing leaks;
- tier blocks + swap blocks <= the host pool's blocks (its fixed size: the budget).

Copy order within a step (the runner follows it): stores (device -> host) first,
then swap-outs, swap-ins, loads (host -> device), copy-on-write, the forward.
A host block read in a step (a load's or a swap-in's source) is held until the
next step begins, so no store of the same step can overwrite it; a device block
written in a step is read by its store before, because stores go first.
"""
