"""`python -m services.api`: run the API with uvicorn (API_HOST, API_PORT)."""

from services.api.app import serve

if __name__ == "__main__":
    serve()
