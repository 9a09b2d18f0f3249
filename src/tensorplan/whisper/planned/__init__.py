"""The planned model and its sessions: graphs built from ops, weights in compute form,
every graph planned once, sessions that bind the plans to memory of their own.

May import the runtime (backends' protocol, pipeline, alloc, ops, graph, tensor) and, of
whisper, `model_files`, `audio` (the backend choice reads a file's length), the options,
the tokenizer and limits; never decoding or the API."""
