"""The API's request and response models, and the typed job spec."""
