"""sglang.test.runners: the rerank fixtures test_openai_server.py imports (our own examples)."""

TEST_RERANK_QUERY_DOCS = [
    {
        "query": "How many people live in Berlin?",
        "documents": ["Berlin is well known for its museums."],
    },
    {
        "query": "What is the capital of France?",
        "documents": ["Paris is the capital of France.", "Berlin is a city in Germany."],
    },
]
