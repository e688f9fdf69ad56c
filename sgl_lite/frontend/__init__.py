"""sgl_lite/frontend: SGLang's frontend language (IR, interpreter, backends). No tensors here.

Layers, each importing only those below it (checked by import-linter, see pyproject.toml):

    backends.runtime, then backends.engine | runtime_endpoint | openai   concrete backends
    api            gen/select/roles/function: validate, build IR
    program        SglFunction: run, run_batch, the lazily started default backend
    interpreter    ProgramState (a facade over its executor), ProgramStateGroup (fork/join)
    | tracing      a program's constant prefix   | globals   the default backend, stored
    executor       runs IR nodes on a worker thread, calling the backend protocol
    sampling | transcript
    backends.base  the Backend protocol (Prompt, GenRequest, GenResult)
    chat_template | choices
    ir             frozen IR nodes, role(), dtype patterns

Shared light logic (regex validation, common prefix, sampling-param names) is `sgl_lite.common`.
"""
