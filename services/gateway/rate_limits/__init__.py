"""Per-tenant requests-per-minute and tokens-per-minute limits, as token buckets refilled
continuously, kept in this process (the default) or in Redis, shared by every gateway replica.

A request reserves its prompt plus the completion it may produce when it is admitted
(limiter.RateLimiter.admit) and settles to what it used when it ends (limiter.Reservation.settle),
so a burst of long answers cannot overrun a limit while they are still streaming, and N replicas
never grant N times a limit."""
