"""The local runtime: CPU stand-ins that speak the same protocols as the GPU runtime.

- ``demo``: a tiny random-weight Qwen3 verifier and on-policy demo conversations.
- ``hidden_states_server``: vLLM's extract_hidden_states protocol on transformers.
- ``train``: the speculators trainer with its device choices patched for the CPU.
"""
