"""The flow runtime: pure over an injected child call. A request's path, folder by folder:

    load/     at model load: the settings and request parameters a flow declares, its child
              models' configs, the flow itself, the check on a probe image, the model states
              bls-serve keeps
    admit/    at the door and before each stage: which requests are refused, dropped or
              skipped, from what was measured
    decode/   the rows of one execute(): images decoded and preprocessed once, on a device
              (numpy or torch), regions cut from them
    call/     the batch a flow sees and its calls to child models: routing, chunking, retries,
              shadow and canary, children run in process
    answer/   the flow's answer, row by row, into each request's outputs (and JSON)

engine.py (FlowRuntime) runs one execute() through them; errors.py and results.py say what
fails a request and with which status; local.py (LocalFlow) runs a flow with no server.
"""
