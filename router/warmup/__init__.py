"""pagedinfer.router.warmup: fill an engine's prefix cache before it takes its share of traffic (docs/router.md).

- `settings`: K (prefixes) and the token budget, their defaults (the operator's spec reads them; no imports);
- `hotness`: the router's own table of hot prefixes, from the token ids it already computes (pure);
- `plan`: which prefixes to replay to which engine, for a new engine and for a scale-in victim's (pure);
- `replay`: sending them, one prefill at a time per engine, marked as warm-up.
"""
