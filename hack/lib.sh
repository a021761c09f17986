# Shared shell helpers for the hack/ scripts; source it, don't run it.

# port_in_use PORT succeeds when something listens on 127.0.0.1:PORT (bash's /dev/tcp, no tools).
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# free_port prints a loopback port nothing listens on, or fails after 100 tries.
free_port() {
  local p
  for _ in $(seq 1 100); do
    p=$((20000 + (RANDOM * 32768 + RANDOM) % 40000))
    if ! port_in_use "$p"; then echo "$p"; return 0; fi
  done
  echo "no free loopback port found" >&2
  return 1
}
