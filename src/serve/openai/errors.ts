/** Errors of the OpenAI-compatible server, answered in OpenAI's shape:
 *  `{"error": {"message", "type", "param", "code"}}` with the HTTP status. */

export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly param: string | null = null,
    readonly code: string | null = null,
    readonly type: string = status >= 500 ? "server_error" : status === 401 ? "authentication_error" : "invalid_request_error",
  ) {
    super(message);
    this.name = "ApiError";
  }

  body(): { error: { message: string; type: string; param: string | null; code: string | null } } {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code } };
  }
}

/** A 400 about one request field. */
export function badField(param: string, message: string): ApiError {
  return new ApiError(400, `${param}: ${message}`, param, "invalid_value");
}
