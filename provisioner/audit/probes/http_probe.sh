# Runs ON THE AUDITED HOST (bash -c SCRIPT HOST UNIT HOST PORT: $0 is the server's host, so that bash's own
# messages name it, "10.0.0.5: connect: Connection refused", not the unit): ask a plain-http vLLM server for /health
# and /v1/models, from the host itself, with the key spec mode gives in $VP_PROBE_KEY (the spec's: set, even
# empty, it is the one used), else (profile mode) the server's own API key (read from the server process as
# vLLM picks it: its first --api-key, else its VLLM_API_KEY; it stays in this shell, never on a command line). Prints where the
# key came from (`@@key-source WHERE`), then each raw HTTP answer after a line `@@ <path>` (bash's words
# after it when there is none). One bash costs a tenth of starting python; https servers get http_probe.py.
pid=$(systemctl show -p MainPID --value "$1")
key= source=
if [ -n "${VP_PROBE_KEY+set}" ]; then
  key=$VP_PROBE_KEY source=given
else
  previous=
  while [ -z "$key" ] && IFS= read -r -d '' word; do
    case $previous,$word in --api-key,*) key=$word ;; *,--api-key=*) key=${word#*=} ;; esac
    [ -n "$key" ] && source="the api-key option on the command line of pid $pid"
    previous=$word
  done 2>/dev/null < "/proc/$pid/cmdline"
  while [ -z "$key" ] && IFS= read -r -d '' entry; do  # vLLM: `args.api_key or [envs.VLLM_API_KEY]`
    case $entry in VLLM_API_KEY=*) key=${entry#*=} source="VLLM_API_KEY of pid $pid" ;; esac
  done 2>/dev/null < "/proc/$pid/environ"
fi
printf '@@key-source %s\n' "${source:-none: pid $pid has no VLLM_API_KEY and no --api-key}"
for path in /health /v1/models; do
  printf '\n@@ %s\n' "$path"
  if exec 3<>"/dev/tcp/$2/$3"; then
    printf 'GET %s HTTP/1.0\r\nHost: %s\r\nAuthorization: Bearer %s\r\n\r\n' "$path" "$2" "$key" >&3
    cat <&3
    exec 3<&-
  fi
done
