# Writes the Kafka command-line tools' --command-config file (path: $1) from the settings the
# services read, so kafka-topics.sh reaches a SASL/TLS cluster exactly as they do. Each [kafka]
# field: its env variable (LAR_KAFKA_SECURITY_PROTOCOL), else the file of $LAR_SECRETS_DIR named
# like it (upper case), else the [kafka] table of $LAR_CONFIG (quoted strings), else the default.
# usage: bash kafka-client.sh /tmp/kafka-client.properties
set -euo pipefail

setting() {  # setting FIELD DEFAULT
  local field="$1" var="LAR_KAFKA_${1^^}"
  if [[ -n "${!var:-}" ]]; then printf '%s' "${!var}"; return; fi
  if [[ -n "${LAR_SECRETS_DIR:-}" && -f "$LAR_SECRETS_DIR/$var" ]]; then
    tr -d '\r\n' < "$LAR_SECRETS_DIR/$var"; return
  fi
  if [[ -n "${LAR_CONFIG:-}" && -f "$LAR_CONFIG" ]]; then
    local found
    found=$(awk -v key="$field" '
      /^[[:space:]]*\[/ { table = $1; next }
      table == "[kafka]" && $0 ~ "^[[:space:]]*" key "[[:space:]]*=" {
        if (match($0, /"[^"]*"/)) { print substr($0, RSTART + 1, RLENGTH - 2); exit }
      }' "$LAR_CONFIG")
    if [[ -n "$found" ]]; then printf '%s' "$found"; return; fi
  fi
  printf '%s' "$2"
}

jaas() {  # a JAAS string value, escaped for JAAS and then for a .properties file
  local value="${1//\\/\\\\}"
  value="${value//\"/\\\"}"
  printf '%s' "${value//\\/\\\\}"
}

protocol=$(setting security_protocol PLAINTEXT)
umask 077
{
  echo "security.protocol=$protocol"
  case "$protocol" in
    SASL_PLAINTEXT|SASL_SSL)
      mechanism=$(setting sasl_mechanism PLAIN)
      case "$mechanism" in
        PLAIN) module=org.apache.kafka.common.security.plain.PlainLoginModule ;;
        SCRAM-SHA-256|SCRAM-SHA-512) module=org.apache.kafka.common.security.scram.ScramLoginModule ;;
        *) echo "kafka-client.sh: unsupported sasl_mechanism $mechanism" >&2; exit 2 ;;
      esac
      echo "sasl.mechanism=$mechanism"
      echo "sasl.jaas.config=$module required username=\"$(jaas "$(setting sasl_plain_username '')")\"" \
        "password=\"$(jaas "$(setting sasl_plain_password '')")\";"
      ;;
    PLAINTEXT|SSL) ;;
    *) echo "kafka-client.sh: unsupported security_protocol $protocol" >&2; exit 2 ;;
  esac
  case "$protocol" in
    SSL|SASL_SSL)
      cafile=$(setting ssl_cafile '')
      if [[ -n "$cafile" ]]; then
        echo "ssl.truststore.type=PEM"
        echo "ssl.truststore.location=$cafile"
      fi
      ;;
  esac
} > "$1"
