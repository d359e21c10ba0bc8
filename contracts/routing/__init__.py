"""What the router and the operator agree on: the demand annotation and the router's environment
(`demand`), the engines' drain timing (`lifecycle`), the routing policies (`policies`) and the warm-up's
defaults and bounds (`warmup`). No imports: the operator validates `spec.router` against them and sets the
router's flags from them.
"""
