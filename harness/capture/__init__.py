"""Recording, transcripts, pcaps and their dissection."""
