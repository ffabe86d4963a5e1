"""What the runtimes run that is not vLLM or the speculators trainer: the local runtime's
demo model and CPU patches (workers/runtimes/local/). The command lines that start them live in
app/runtimes/, where the API's dry-run plans and the doctor read them too."""
