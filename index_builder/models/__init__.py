"""The ONNX models, loaded by builds and servers alike: the runner, the embedder and cross-encoder, the
late-interaction token encoders, int8 quantisation and (torch extra) the fp32 export. Imports the shared words
only."""
