"""The local runtime: CPU stand-ins that speak the same protocols as the GPU runtime.

- ``demo``: a tiny random-weight Qwen3 verifier and on-policy demo conversations.
- ``hidden_states_connector``: vLLM's hidden-states connector made to work on a CPU (the
  hidden-states server is vLLM's CPU wheel).
- ``train``: the speculators trainer with its device choices patched for the CPU.
"""
