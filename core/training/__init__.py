"""Training the CTR model: the network, its knobs, fitting and the ranking metrics."""
