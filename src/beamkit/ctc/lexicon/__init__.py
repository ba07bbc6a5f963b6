"""The lexicon beam search (flashlight's algorithm, behind torchaudio's ``ctc_decoder``): the lexicon trie
(:mod:`.trie`), the search and its language models (:mod:`.search`), its compiled driver and frame loop
(:mod:`.compiled`, :mod:`.kernel`)."""
