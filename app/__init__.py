"""SpecDeck control plane."""
