"""At model load: a flow's settings and request parameters, its children's configs, the flow
itself and its check on a probe image, and the model states bls-serve keeps for it."""
