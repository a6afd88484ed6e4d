-- Load int4serve's /v1/completions with wrk:
--   wrk -t4 -c64 -d60s --latency -s deploy/wrk/completions.lua http://127.0.0.1:8000
-- Environment: INT4SERVE_MODEL (default "tiny", the served model name),
-- INT4SERVE_MAX_TOKENS (default 64), INT4SERVE_API_KEY (sent as a bearer
-- token when set). Every request asks for exactly max_tokens tokens
-- (ignore_eos), greedy, without streaming. For tokens/s, time to first token
-- and inter-token latency, use bench/serve.

local model = os.getenv("INT4SERVE_MODEL") or "tiny"
local max_tokens = tonumber(os.getenv("INT4SERVE_MAX_TOKENS") or "64")
local api_key = os.getenv("INT4SERVE_API_KEY")

wrk.method = "POST"
wrk.path = "/v1/completions"
wrk.headers["Content-Type"] = "application/json"
if api_key and api_key ~= "" then
   wrk.headers["Authorization"] = "Bearer " .. api_key
end
wrk.body = string.format(
   '{"model": "%s", "prompt": "The quick brown fox jumps over the lazy dog. '
      .. 'Write a short story about it.", "max_tokens": %d, "temperature": 0, '
      .. '"ignore_eos": true, "stream": false}',
   model, max_tokens)

local failures = 0

function response(status, headers, body)
   if status ~= 200 then
      failures = failures + 1
      if failures <= 3 then
         io.stderr:write(string.format("HTTP %d: %s\n", status, body:sub(1, 200)))
      end
   end
end

function done(summary, latency, requests)
   local secs = summary.duration / 1e6
   io.write(string.format("requests/s: %.2f  (completion tokens/s at most %.1f)\n",
                          summary.requests / secs, summary.requests * max_tokens / secs))
   for _, p in ipairs({50, 90, 99}) do
      io.write(string.format("latency p%d: %.1f ms\n", p, latency:percentile(p) / 1000))
   end
   io.write(string.format("errors: connect %d, read %d, write %d, timeout %d, status %d\n",
                          summary.errors.connect, summary.errors.read, summary.errors.write,
                          summary.errors.timeout, summary.errors.status))
end
