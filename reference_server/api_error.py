"""The error a text front end answers a request with (text_api.py and the APIs over it, tools.py): its
status and OpenAI's fields; `response()` is OpenAI's shape, a front end may render it in its own."""

from __future__ import annotations

from aiohttp import web


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def response(self) -> web.Response:
        """OpenAI's error shape."""
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return web.json_response(body, status=self.status, headers=self.headers)
