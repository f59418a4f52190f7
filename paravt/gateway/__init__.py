"""An OpenAI-compatible gateway that turns any agent program's chat requests into paravt
trajectories, video included: `episode` renders token-incrementally, `media` reads
video parts, `batcher` shares engine calls, `app` serves it (FastAPI), `serve` is the CLI."""
