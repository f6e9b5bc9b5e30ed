// A cluster's credentials (docs/cluster.md, "Credentials"): `maxkernel cluster init DIR`
// writes them, every process of the cluster reads them back from `--token-file DIR/token`.
//
// DIR/token       the secret: 32 random bytes as 64 hex digits (0600). It never crosses the
//                 wire: what the transports use is derived from it.
// DIR/ca.pem      the cluster CA's certificate (self-signed, ECDSA P-256). Its private key is
//                 not kept: no further certificate can be issued for this cluster.
// DIR/cluster.pem the certificate every process of the cluster presents (one shared
//                 certificate, signed by the CA; peers verify it against ca.pem: mutual TLS).
// DIR/cluster.key its private key, PKCS#8 encrypted (AES-256-CBC) under a passphrase derived
//                 from the token (0600): the directory without the token is useless.
// The ZeroMQ CURVE keypairs of the client port (server and client) are derived from the
// token too (HKDF-SHA256), so no CURVE secret is stored anywhere.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace maxkernel::cluster {

struct cluster_credentials {
  std::string directory;         // where the files are (the token file's directory)
  std::string token_file;
  std::string ca_file;           // DIR/ca.pem
  std::string certificate_file;  // DIR/cluster.pem
  std::string key_file;          // DIR/cluster.key (encrypted)
  std::string key_passphrase;    // decrypts key_file; derived from the token
  // ZeroMQ CURVE keys, Z85 (40 characters each).
  std::string curve_server_public;
  std::string curve_server_secret;
  std::string curve_client_public;
  std::string curve_client_secret;
  std::string cluster_id;  // 16 hex digits of the CA certificate's SHA-256, for logs
  // Things worth telling the operator that do not stop the process (a token that others
  // can read, a certificate about to expire).
  std::vector<std::string> warnings;
};

// File names inside DIR.
inline constexpr const char* token_file_name = "token";
inline constexpr const char* ca_file_name = "ca.pem";
inline constexpr const char* certificate_file_name = "cluster.pem";
inline constexpr const char* key_file_name = "cluster.key";

enum class init_status {
  written,  // all files written
  exists,      // DIR already holds credentials: nothing was touched
  unwritable,  // DIR cannot be created or written
  failed,      // OpenSSL failed (an environment error)
};

struct init_result {
  init_status status = init_status::failed;
  std::string error;               // when not written
  std::vector<std::string> files;  // the paths written, token last
};

// Writes a new cluster's credentials into `dir` (created 0700 when missing). Refuses to touch
// anything when dir/token exists. The token is written last, with O_EXCL: a directory
// holding a token always holds the matching files.
init_result init_cluster_credentials(const std::string& dir);

// Reads the credentials of the cluster whose token is `token_file`; the other files must
// sit beside it. Checks that the key decrypts with the token, matches the certificate and
// that the certificate verifies against the CA. A token readable by group or others is
// accepted (secret stores often mount files 0644) with a warning. On failure: nullopt and
// `error` names the file and what to do; a token that does not open the key (another
// cluster's token beside these files) is an authentication failure (exit 3): its message
// starts with "authentication failed". Every other failure is bad input (exit 2).
std::optional<cluster_credentials> read_cluster_credentials(const std::string& token_file,
                                                            std::string& error);

}  // namespace maxkernel::cluster
