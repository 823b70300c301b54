"""HTTP edge pieces the manager, the built-in engine and the weight server share: body parsing
(`body`), the one error shape (`errors`: `{"error": {"message": ...}}`), the SSE writer (`sse`),
read timeouts (`serve`), taking the port (`listen`) and the bearer-token check (`auth`). Every
server answers `GET /health`."""
