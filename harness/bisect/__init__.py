"""harness bisect: the first registry build whose answer to a question differs."""
