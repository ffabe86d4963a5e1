"""API key roles, least to most: ``inference`` (the OpenAI-compatible /v1 alone), ``member``
(train, deploy and chat; not keys, secrets or webhooks), ``admin`` (everything). Checked by
app/api/deps.py; the gateway takes every role. Without imports, so the CLI can name them."""

ROLES = ("inference", "member", "admin")
