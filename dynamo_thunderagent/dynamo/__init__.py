"""The Dynamo adapter: a router component on the frontend's request path.

Dynamo 1.6's frontend has no Python hook inside its router, so the classifier
and selector run in a component the frontend sends every request of the model
to (it registers as the model's handler for tokenized requests). This package
only translates: requests and stream chunks to classifier inputs and events
(:mod:`.translate`, pure), and decisions to Dynamo calls (:mod:`.router`).
"""
