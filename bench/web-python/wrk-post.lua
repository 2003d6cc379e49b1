-- wrk script: POST the request body read from the file named by $WEB_BODY_FILE.
local file = assert(io.open(os.getenv("WEB_BODY_FILE"), "rb"))
wrk.method = "POST"
wrk.body = file:read("*a")
wrk.headers["Content-Type"] = "application/json"
file:close()
