"""Tasks that exercise the decoder on real models: the dates task and the g2p evaluation."""
