local TERMINAL = {succeeded = true, failed = true, cancelled = true, expired = true}
