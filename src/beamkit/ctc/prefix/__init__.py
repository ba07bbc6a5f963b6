"""The prefix beam search (pyctcdecode's algorithm, word n-gram fusion and hotwords): its compiled frame loop
(:mod:`.kernel`), the prefix store (:mod:`.nodes`), the fusion rules and LM cache (:mod:`.fusion`), the hotword trie
(:mod:`.chartrie`) and the driver over a batch (:mod:`.run`). Its public face is :class:`beamkit.ctc.Decoder`."""
