"""The Redis plumbing under the queue: connections with inferq's timeouts and credentials (:mod:`.connection`),
Lua scripts loaded once and called by SHA (:mod:`.scripting`), the fault model every process shares (:mod:`.faults`),
and the cache's ACL users per role (:mod:`.acl`)."""
