"""The HTTP API v1 (docs/api.md): a FastAPI app served by Mangum on Lambda and by uvicorn in the emulator.

``app.py`` is the Lambda entry point (settings read at import); ``api.py`` builds the app for anyone else.
"""
