"""`specdeck doctor`: what a worker host has against what its runtime needs."""
