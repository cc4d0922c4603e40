"""The batch a flow sees and its calls to child models: which candidate answers, how a call
is chunked, sent, retried, mirrored (shadow) or diverted (canary), and children run in process."""
