"""Model files in and out: find a model, read CTranslate2, openai `.pt` and whisper.cpp ggml
files as one `WhisperWeights`, cache compute-form weights, export, random weights.

May import the errors/files leaves and, of whisper, the tokenizer and `audio` (the mel
filters an export writes); never the planned model, decoding or the API."""
