"""The floor of the Lambda-shaped gateway figures (bench.lambda_gateway): the least a FastAPI app on Mangum can be,
one route (``POST /v1/jobs`` answering 202 with the JSON body's size), no Redis, no settings, no logging set up.
What any FastAPI + Mangum Lambda pays; the gateway's cold start and warm invocations are reported as ratios to it."""

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from mangum import Mangum

app = FastAPI()


@app.post("/v1/jobs", status_code=202)
async def submit(request: Request) -> JSONResponse:
    body = await request.json()
    return JSONResponse({"id": "job_floor", "status": "queued", "fields": len(body)}, status_code=202)


handler = Mangum(app, lifespan="off")
