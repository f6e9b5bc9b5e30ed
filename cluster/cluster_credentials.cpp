#include "cluster/cluster_credentials.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <zmq.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <tuple>

namespace maxkernel::cluster {

namespace {

namespace fs = std::filesystem;

constexpr size_t token_bytes = 32;
constexpr long validity_seconds = 10L * 365 * 24 * 3600;  // a cluster outlives a rotation plan
constexpr long warn_expiry_seconds = 30L * 24 * 3600;

// Labels of the secrets derived from the token: one per use, so that no two uses share a key.
constexpr const char* passphrase_label = "maxkernel cluster v1: tls key passphrase";
constexpr const char* curve_server_label = "maxkernel cluster v1: curve server secret";
constexpr const char* curve_client_label = "maxkernel cluster v1: curve client secret";

template <class T, void (*Free)(T*)>
struct deleter {
  void operator()(T* p) const { Free(p); }
};
using pkey_ptr = std::unique_ptr<EVP_PKEY, deleter<EVP_PKEY, EVP_PKEY_free>>;
using x509_ptr = std::unique_ptr<X509, deleter<X509, X509_free>>;
using bio_ptr = std::unique_ptr<BIO, deleter<BIO, BIO_free_all>>;
using bn_ptr = std::unique_ptr<BIGNUM, deleter<BIGNUM, BN_free>>;
using pkey_ctx_ptr = std::unique_ptr<EVP_PKEY_CTX, deleter<EVP_PKEY_CTX, EVP_PKEY_CTX_free>>;
using store_ptr = std::unique_ptr<X509_STORE, deleter<X509_STORE, X509_STORE_free>>;
using store_ctx_ptr =
  std::unique_ptr<X509_STORE_CTX, deleter<X509_STORE_CTX, X509_STORE_CTX_free>>;

// Thrown inside this file only; the public functions turn it into their error.
struct credential_error {
  std::string message;
  bool filesystem = false;  // the directory or a file, not the cryptography
};

// The OpenSSL error queue as text (and emptied), for messages.
std::string openssl_errors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty())
      out += "; ";
    out += buf;
  }
  return out.empty() ? "no OpenSSL detail" : out;
}

[[noreturn]] void fail_openssl(const std::string& what) {
  throw credential_error{fmt::format("{}: {}", what, openssl_errors())};
}

std::string to_hex(const unsigned char* data, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    out += digits[data[i] >> 4];
    out += digits[data[i] & 15];
  }
  return out;
}

std::array<unsigned char, 32> hkdf(const std::vector<unsigned char>& token, const char* label) {
  std::array<unsigned char, 32> out{};
  pkey_ctx_ptr ctx{EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr)};
  size_t len = out.size();
  if (!ctx || EVP_PKEY_derive_init(ctx.get()) <= 0
      || EVP_PKEY_CTX_set_hkdf_md(ctx.get(), EVP_sha256()) <= 0
      || EVP_PKEY_CTX_set1_hkdf_key(ctx.get(), token.data(), static_cast<int>(token.size())) <= 0
      || EVP_PKEY_CTX_add1_hkdf_info(ctx.get(), reinterpret_cast<const unsigned char*>(label),
                                     static_cast<int>(std::strlen(label)))
           <= 0
      || EVP_PKEY_derive(ctx.get(), out.data(), &len) <= 0 || len != out.size())
    fail_openssl("cannot derive a key from the token (HKDF-SHA256)");
  return out;
}

std::string key_passphrase(const std::vector<unsigned char>& token) {
  auto k = hkdf(token, passphrase_label);
  return to_hex(k.data(), k.size());
}

// A CURVE keypair (Z85) whose secret is derived from the token.
std::pair<std::string, std::string> curve_keypair(const std::vector<unsigned char>& token,
                                                  const char* label) {
  auto k = hkdf(token, label);
  char secret[41] = {};
  char pub[41] = {};
  if (!zmq_z85_encode(secret, k.data(), k.size()))
    throw credential_error{"cannot encode a CURVE key (Z85)"};
  if (zmq_curve_public(pub, secret) != 0)
    throw credential_error{fmt::format(
      "cannot compute a CURVE public key: {} (is libzmq built with CURVE support?)",
      zmq_strerror(zmq_errno()))};
  return {pub, secret};
}

// ---- Writing ------------------------------------------------------------------------------

pkey_ptr new_ec_key() {
  pkey_ptr key{EVP_EC_gen("P-256")};
  if (!key)
    fail_openssl("cannot generate an EC P-256 key");
  return key;
}

void add_extension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (!ext)
    fail_openssl(fmt::format("cannot make the certificate extension {}", OBJ_nid2sn(nid)));
  int ok = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  if (!ok)
    fail_openssl("cannot add a certificate extension");
}

// A certificate for `key`, named `common_name`, signed by `issuer_key` (self-signed when
// `issuer` is null).
x509_ptr make_certificate(EVP_PKEY* key, const std::string& common_name, X509* issuer,
                          EVP_PKEY* issuer_key, bool is_ca) {
  x509_ptr cert{X509_new()};
  if (!cert || !X509_set_version(cert.get(), 2))
    fail_openssl("cannot make a certificate");
  bn_ptr serial{BN_new()};
  if (!serial || !BN_rand(serial.get(), 63, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY)
      || !BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert.get())))
    fail_openssl("cannot make a serial number");
  // An hour of slack for clocks that lag behind the host that ran init.
  if (!X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600)
      || !X509_gmtime_adj(X509_getm_notAfter(cert.get()), validity_seconds))
    fail_openssl("cannot set the validity");
  X509_NAME* name = X509_get_subject_name(cert.get());
  if (!X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                                  reinterpret_cast<const unsigned char*>("maxkernel"), -1, -1, 0)
      || !X509_NAME_add_entry_by_txt(
        name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(common_name.c_str()),
        -1, -1, 0))
    fail_openssl("cannot name the certificate");
  X509* signer = issuer ? issuer : cert.get();
  if (!X509_set_issuer_name(cert.get(), X509_get_subject_name(signer))
      || !X509_set_pubkey(cert.get(), key))
    fail_openssl("cannot fill the certificate");
  if (is_ca) {
    add_extension(cert.get(), signer, NID_basic_constraints, "critical,CA:TRUE,pathlen:0");
    add_extension(cert.get(), signer, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    add_extension(cert.get(), signer, NID_basic_constraints, "critical,CA:FALSE");
    add_extension(cert.get(), signer, NID_key_usage, "critical,digitalSignature");
    // Every process is both: it accepts (supervisor) and connects (nodes), one certificate.
    add_extension(cert.get(), signer, NID_ext_key_usage, "serverAuth,clientAuth");
  }
  add_extension(cert.get(), signer, NID_subject_key_identifier, "hash");
  add_extension(cert.get(), signer, NID_authority_key_identifier, "keyid:always");
  if (!X509_sign(cert.get(), issuer_key, EVP_sha256()))
    fail_openssl("cannot sign the certificate");
  return cert;
}

std::string bio_text(BIO* bio) {
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  return std::string(data, static_cast<size_t>(n));
}

std::string certificate_pem(X509* cert) {
  bio_ptr bio{BIO_new(BIO_s_mem())};
  if (!bio || !PEM_write_bio_X509(bio.get(), cert))
    fail_openssl("cannot write a certificate as PEM");
  return bio_text(bio.get());
}

std::string encrypted_key_pem(EVP_PKEY* key, const std::string& passphrase) {
  bio_ptr bio{BIO_new(BIO_s_mem())};
  if (!bio
      || !PEM_write_bio_PKCS8PrivateKey(bio.get(), key, EVP_aes_256_cbc(),
                                        const_cast<char*>(passphrase.c_str()),
                                        static_cast<int>(passphrase.size()), nullptr, nullptr))
    fail_openssl("cannot write the encrypted private key");
  return bio_text(bio.get());
}

// Writes `content` to `path` with exactly `mode`; with `exclusive`, fails if it exists.
void write_file(const fs::path& path, const std::string& content, mode_t mode, bool exclusive) {
  int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (exclusive ? O_EXCL : O_TRUNC);
  int fd = ::open(path.c_str(), flags, mode);
  if (fd < 0)
    throw credential_error{
      fmt::format("cannot write {}: {}", path.string(), std::strerror(errno)), true};
  bool ok = ::fchmod(fd, mode) == 0;
  size_t done = 0;
  while (ok && done < content.size()) {
    ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    ok = n > 0;
    if (ok)
      done += static_cast<size_t>(n);
  }
  ok = ok && ::fsync(fd) == 0;
  int saved = errno;
  ok = (::close(fd) == 0) && ok;
  if (!ok)
    throw credential_error{
      fmt::format("cannot write {}: {}", path.string(), std::strerror(saved ? saved : errno)),
      true};
}

// ---- Reading ------------------------------------------------------------------------------

std::string read_small_file(const fs::path& path, const char* what) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw credential_error{fmt::format(
      "{} {} does not exist: keep the token file beside the files `maxkernel cluster init "
      "DIR` wrote ({}, {}, {}, {})",
      what, path.string(), token_file_name, ca_file_name, certificate_file_name,
      key_file_name)};
  if (!fs::is_regular_file(path, ec))
    throw credential_error{fmt::format("{} {} is not a regular file", what, path.string())};
  if (fs::file_size(path, ec) > 1 << 20)
    throw credential_error{fmt::format("{} {} is larger than 1 MiB", what, path.string())};
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  if (!in && !in.eof())
    throw credential_error{
      fmt::format("cannot read {} {}: {}", what, path.string(), std::strerror(errno))};
  return ss.str();
}

std::vector<unsigned char> parse_token(const std::string& text, const std::string& path) {
  std::string t = text;
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back())))
    t.pop_back();
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9')
      return c - '0';
    if (c >= 'a' && c <= 'f')
      return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
      return c - 'A' + 10;
    return -1;
  };
  bool ok = t.size() == 2 * token_bytes;
  for (size_t i = 0; ok && i < t.size(); ++i)
    ok = hex(t[i]) >= 0;
  if (!ok)
    throw credential_error{fmt::format(
      "{} is not a maxkernel cluster token (one line of {} hex digits, as `maxkernel cluster "
      "init DIR` writes DIR/token)",
      path, 2 * token_bytes)};
  std::vector<unsigned char> bytes(token_bytes);
  for (size_t i = 0; i < token_bytes; ++i)
    bytes[i] = static_cast<unsigned char>(hex(t[2 * i]) * 16 + hex(t[2 * i + 1]));
  return bytes;
}

x509_ptr read_certificate(const std::string& pem, const fs::path& path) {
  bio_ptr bio{BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()))};
  x509_ptr cert{bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr};
  if (!cert)
    throw credential_error{fmt::format("{} holds no PEM certificate: {}", path.string(),
                                       openssl_errors())};
  return cert;
}

std::string certificate_fingerprint(X509* cert) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (!X509_digest(cert, EVP_sha256(), md, &n))
    fail_openssl("cannot hash the CA certificate");
  return to_hex(md, n).substr(0, 16);
}

std::string verify_error(X509* cert, X509* ca) {
  store_ptr store{X509_STORE_new()};
  store_ctx_ptr ctx{X509_STORE_CTX_new()};
  if (!store || !ctx || !X509_STORE_add_cert(store.get(), ca)
      || !X509_STORE_CTX_init(ctx.get(), store.get(), cert, nullptr))
    fail_openssl("cannot set up the certificate check");
  if (X509_verify_cert(ctx.get()) == 1)
    return "";
  return X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx.get()));
}

cluster_credentials read(const std::string& token_file) {
  cluster_credentials c;
  fs::path token_path = fs::absolute(fs::path(token_file)).lexically_normal();
  fs::path dir = token_path.parent_path();
  c.token_file = token_path.string();
  c.directory = dir.string();
  c.ca_file = (dir / ca_file_name).string();
  c.certificate_file = (dir / certificate_file_name).string();
  c.key_file = (dir / key_file_name).string();

  std::error_code ec;
  if (!fs::exists(token_path, ec))
    throw credential_error{fmt::format(
      "the token file {} does not exist (`maxkernel cluster init DIR` writes DIR/token)",
      token_file)};
  auto token = parse_token(read_small_file(token_path, "the token file"), token_file);
  struct stat st{};
  if (::stat(token_path.c_str(), &st) == 0 && (st.st_mode & 077))
    c.warnings.push_back(fmt::format(
      "the token file {} can be read by other users (mode {:04o}): anyone who reads it can "
      "join the cluster; chmod 600 {}",
      token_file, st.st_mode & 07777, token_file));

  auto ca = read_certificate(read_small_file(c.ca_file, "the cluster CA certificate"), c.ca_file);
  auto cert = read_certificate(read_small_file(c.certificate_file, "the cluster certificate"),
                               c.certificate_file);
  std::string key_pem = read_small_file(c.key_file, "the cluster private key");
  c.key_passphrase = key_passphrase(token);
  bio_ptr bio{BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size()))};
  pkey_ptr key{bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr,
                                             const_cast<char*>(c.key_passphrase.c_str()))
                   : nullptr};
  if (!key) {
    ERR_clear_error();
    throw credential_error{fmt::format(
      "authentication failed: the private key {} does not open with the token {}: the token "
      "and the key come from different `maxkernel cluster init` runs (another cluster's "
      "token?)",
      c.key_file, token_file)};
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    throw credential_error{fmt::format("the certificate {} does not belong to the key {}",
                                       c.certificate_file, c.key_file)};
  }
  std::string why = verify_error(cert.get(), ca.get());
  if (!why.empty())
    throw credential_error{fmt::format("the certificate {} does not verify against {}: {}",
                                       c.certificate_file, c.ca_file, why)};
  time_t soon = std::time(nullptr) + warn_expiry_seconds;
  if (X509_cmp_time(X509_get0_notAfter(cert.get()), &soon) < 0)
    c.warnings.push_back(fmt::format(
      "the cluster certificate {} expires within 30 days: init a new cluster directory",
      c.certificate_file));
  c.cluster_id = certificate_fingerprint(ca.get());
  std::tie(c.curve_server_public, c.curve_server_secret) = curve_keypair(token, curve_server_label);
  std::tie(c.curve_client_public, c.curve_client_secret) = curve_keypair(token, curve_client_label);
  return c;
}

}  // namespace

init_result init_cluster_credentials(const std::string& dir_text) {
  init_result r;
  fs::path dir(dir_text);
  std::error_code ec;
  std::vector<std::string> present;
  for (const char* name : {token_file_name, ca_file_name, certificate_file_name, key_file_name})
    if (fs::exists(fs::symlink_status(dir / name, ec)))
      present.push_back((dir / name).string());
  if (!present.empty()) {
    r.status = init_status::exists;
    r.error = fmt::format(
      "{} already holds cluster credentials ({}); refusing to overwrite them: every process "
      "of that cluster would be locked out. Remove them first, or init another directory",
      dir.string(), fmt::join(present, ", "));
    return r;
  }
  try {
    if (!fs::exists(dir, ec)) {
      fs::create_directories(dir, ec);
      if (ec)
        throw credential_error{
          fmt::format("cannot create the directory {}: {}", dir.string(), ec.message()), true};
      fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace, ec);
    } else if (!fs::is_directory(dir, ec)) {
      throw credential_error{fmt::format("{} exists and is not a directory", dir.string()), true};
    }
    if (::access(dir.c_str(), W_OK) != 0)
      throw credential_error{
        fmt::format("cannot write into {}: {}", dir.string(), std::strerror(errno)), true};

    std::vector<unsigned char> token(token_bytes);
    if (RAND_bytes(token.data(), static_cast<int>(token.size())) != 1)
      fail_openssl("cannot draw random bytes for the token");
    // Names unique to this cluster: a peer of another cluster then fails with "unable to get
    // local issuer certificate" instead of finding its own CA under the same name.
    unsigned char name_id[4];
    if (RAND_bytes(name_id, sizeof name_id) != 1)
      fail_openssl("cannot draw random bytes for the cluster's name");
    std::string cluster_name = "maxkernel cluster " + to_hex(name_id, sizeof name_id);
    auto ca_key = new_ec_key();
    auto ca = make_certificate(ca_key.get(), cluster_name + " CA", nullptr, ca_key.get(), true);
    auto key = new_ec_key();
    auto cert = make_certificate(key.get(), cluster_name + " process", ca.get(), ca_key.get(),
                                 false);
    std::string key_pem = encrypted_key_pem(key.get(), key_passphrase(token));

    write_file(dir / ca_file_name, certificate_pem(ca.get()), 0644, false);
    r.files.push_back((dir / ca_file_name).string());
    write_file(dir / certificate_file_name, certificate_pem(cert.get()), 0644, false);
    r.files.push_back((dir / certificate_file_name).string());
    write_file(dir / key_file_name, key_pem, 0600, false);
    r.files.push_back((dir / key_file_name).string());
    write_file(dir / token_file_name, to_hex(token.data(), token.size()) + "\n", 0600, true);
    r.files.push_back((dir / token_file_name).string());
    OPENSSL_cleanse(token.data(), token.size());
    r.status = init_status::written;
  } catch (const credential_error& e) {
    r.status = e.filesystem ? init_status::unwritable : init_status::failed;
    r.error = e.message;
  }
  return r;
}

std::optional<cluster_credentials> read_cluster_credentials(const std::string& token_file,
                                                            std::string& error) {
  try {
    return read(token_file);
  } catch (const credential_error& e) {
    error = e.message;
  } catch (const std::exception& e) {
    error = fmt::format("cannot read the cluster credentials of {}: {}", token_file, e.what());
  }
  return std::nullopt;
}

}  // namespace maxkernel::cluster
