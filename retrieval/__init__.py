"""drmas_retrieval: corpora, BM25 / dense indexes, the /retrieve server and client. Imports nothing from drmas_bench."""
