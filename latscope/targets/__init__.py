"""Demo and test servers, not part of the measuring pipeline: targets to point latscope at.

    python -m latscope.targets.echo --port 8765      # a small HTTP target that answers after a delay
    python -m latscope.targets.stream --port 0       # an OpenAI-compatible token streamer

They import nothing else from latscope, so they can run anywhere aiohttp (echo) or httptools (stream)
is installed, and a change to the tool cannot change the servers it is tested against.
"""
