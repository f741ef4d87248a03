"""The registries' llama.cpp builds as a whole: listing them, and watching the newest."""
