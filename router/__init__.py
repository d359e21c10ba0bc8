"""pagedinfer.router: a prefix-aware OpenAI front for several engines (no torch; docs/router.md)."""
